"""Process and Ray plumbing of the driver and the actors: connecting to Ray and its security (ray_connect,
ray_security), the process environment (gc_tuning, malloc_env, quiet_logs), engine-call fault windows (faults),
overlapping a phase with the next (overlap), stopping on signals (stopping) and restarting actors (supervisor).
Light on purpose: `import orchestrator` installs gc_tuning and quiet_logs from here before torch loads."""
