"""What turns memory into vectors, shared by the indexer (documents) and search (query text): the space
descriptors' embedders and the text profile that says what text an object contributes."""
