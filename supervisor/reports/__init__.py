"""Reports computed from a job's logs after the fact (no runtime module imports them)."""
