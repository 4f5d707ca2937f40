"""The Llama-family decoder: the network (llama.py), LoRA (lora.py), its config, weights, tokenizer and fine-
tuned snapshot."""
