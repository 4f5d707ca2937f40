"""llama.cpp's GGUF files: tensors and config (file.py), Llama 3 rope scaling (rope.py), the tokenizer
(tokenizer.py)."""
