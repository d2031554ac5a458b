"""The scheduler process: its loop and step, partition leases, planning, rate limits and its SQL."""
