"""Token trees: the draft grows a tree per request (`drafting`), the target verifies
every node in one pass and accepts the longest matching path (`verification`), and one
`TreeSession` owns each request's tree from the step that drafts it to the step that
verifies it (`session`)."""
