"""BM25 retrieval over a wiki-18 style passage corpus: the index builder, the HTTP server and its client."""
