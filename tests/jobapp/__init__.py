"""An installed app of the test project whose jobs module registers @job functions (autodiscovery)."""
