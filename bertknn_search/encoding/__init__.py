"""The encoder: text -> states at [MASK] and p_BERT; where it runs, in what arithmetic, from which files."""
