"""OpenSearch index mappings, shipped as package data."""
