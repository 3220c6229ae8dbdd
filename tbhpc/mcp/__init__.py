"""MCP package: tasks whose tools live in stdio MCP tool servers (ThinkingBox's, or tbhpc's domains
served by `tbhpc mcp-serve`) run through the same episode loop as built-in ones: the client and
its warm pool (`client`), the servers file (`servers`), the Environment (`env`), serve, export."""
