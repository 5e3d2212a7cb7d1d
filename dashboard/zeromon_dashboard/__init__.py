"""The Dash dashboard (`zeromon dashboard`); built on the live sources of zeromon.sources."""
