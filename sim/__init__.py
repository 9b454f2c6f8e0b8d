"""servesim's engine: requests, the paged KV allocator, batch shapes, cost models,
the SimPy engine process and the metrics it records. It decides nothing: policies do."""
