"""Inputs and outputs: event sources (Parquet, Arrow, Spark), followed folders, Spark
Structured Streaming, and the committed output folder."""
