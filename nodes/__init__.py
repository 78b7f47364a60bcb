"""Real search engines for the OpenSearch and Elasticsearch backends, started from Maven Central jars."""
