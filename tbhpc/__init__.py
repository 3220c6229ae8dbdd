"""tbhpc: train and evaluate tool-using LLM agents with database-state rewards."""
__version__ = "0.1.0"
