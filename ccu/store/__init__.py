"""Where results live: the results store (atomic writes, reuse of a saved run), the records that
name a run and its result keys, the committed reference results and plug-in code identity.

It imports no method, no run and no report: any of those can read and write results."""
