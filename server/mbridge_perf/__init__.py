"""mbridge-perf: skills and an MCP tool server for Megatron Bridge training performance."""

__version__ = "0.1.0"
