"""Hybrid verification attention in the target: the cached prefix on a paged kernel that
returns its log-sum-exp (`prefix_attention`), the step's own tokens under a causal or
tree mask, merged exactly (`hybrid`), and the routing of every target layer to it where
it is exact (`routing`)."""
