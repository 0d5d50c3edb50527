"""Getting requests into the store: validate, quarantine, dedupe, write; live follow; `collect`, the OTLP receiver
that spools what it acknowledges into the follow path."""
