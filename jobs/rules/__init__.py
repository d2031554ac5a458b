"""What a job must satisfy (field, target and whole-job rules) and what a create or an edit means."""
