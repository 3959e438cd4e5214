"""One reader per source format; each returns a validated :class:`plexgt.data.graph.GraphData`."""
