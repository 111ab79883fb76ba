"""glmdeploy_control: what runs on the control node only (never installed on a node).

The run lock, the artifact server, the bundle packer, ``make weights`` and the fleet reports
(the fixture model's generator is test support: ``tests/support/fixture_model``). The node's
package (``glmdeploy``) is what a release installs; this one may import it, never the other
way round.
"""
