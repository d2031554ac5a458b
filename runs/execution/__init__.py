"""The executor process: claiming, call slots, targets, retries and outcomes, run leases, breakers."""
