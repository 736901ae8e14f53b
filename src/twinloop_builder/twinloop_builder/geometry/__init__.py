"""The geometry layer of a twin: RGB-D frames with their camera poses fused into a surface
(`fusion`), and that surface split into the table and the objects on it (`objects`)."""
