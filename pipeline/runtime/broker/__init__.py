"""The embedded broker and its supervision: `embedded` (Tansu, started and refused when the port
holds a broker that is not ours), `keeper` (restart a broker that died), `epoch` (positions after a
restart), `watch` (whether this process can reach the broker now)."""
