"""glmdeploy_control: what runs on the control node only (never installed on a node).

The run lock, the artifact server, the bundle packer, the fixture model, ``make weights`` and
the fleet reports. The node's package (``glmdeploy``) is what a release installs; this one may
import it, never the other way round.
"""
