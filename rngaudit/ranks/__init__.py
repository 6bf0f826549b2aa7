"""The cross-rank path: exchange between ranks, the rules, the session that concludes."""
