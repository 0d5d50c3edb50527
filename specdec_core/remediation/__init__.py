"""Stop the bleeding and find who was hurt: the purge plan, purges against a production cache, and the
incident report drafted from the evidence."""
