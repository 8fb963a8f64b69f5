"""Durable, correct AI-agent sessions on trio."""
