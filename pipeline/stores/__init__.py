"""Stores: the ClickHouse warehouse (evidence, requests, rollouts), vectors and blobs."""
