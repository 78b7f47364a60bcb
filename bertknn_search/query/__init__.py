"""The query layer: question -> IR -> filtered kNN -> interpolation -> answer (Searcher.score_batch)."""
