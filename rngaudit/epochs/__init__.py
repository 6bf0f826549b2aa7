"""The order check at each epoch's first batch: what each rank shards and draws."""
