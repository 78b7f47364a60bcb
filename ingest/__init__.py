"""Corpus ingest: readers -> sentences -> contexts -> store."""
