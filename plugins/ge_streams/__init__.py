"""Stream allocators: assign each scheduled node to a stream and insert events."""
