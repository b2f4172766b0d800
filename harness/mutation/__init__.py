"""Mutation testing of vLLM's model code: first-order mutants, the corpus, the runner and
the reports."""
