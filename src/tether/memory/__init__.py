"""Scoped memory and knowledge: records, embeddings, recall, documents (DESIGN §8)."""
