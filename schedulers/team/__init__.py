"""The team's machinery every strategy shares: seats and placement, an executor's view of
the team (barriers, published counts), and the Coordinator's abort protocol."""
