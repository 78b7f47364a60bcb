"""The engine layer: OpenSearch and Elasticsearch as one backend with two small dialects."""
