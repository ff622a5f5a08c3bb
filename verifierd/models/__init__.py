"""Models built here for tests, benchmarks and the demo: the trained tiny Llama
(trained_model.py), its corpus (training_corpus.py) and training loop (training.py).
The random-weight tiny model they start from is verifierd.tiny_model."""
