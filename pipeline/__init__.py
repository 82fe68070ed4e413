"""llmpipe: a Kafka-native LLM-serving pipeline."""

__version__ = "0.1.0"
