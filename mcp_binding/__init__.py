"""The MCP binding (`pamledger mcp`): PAMSPEC's MCP tools and resources over stdio and streamable HTTP, a client
of the service through the SDK like any other (docs/protocol.md, "The MCP binding")."""
