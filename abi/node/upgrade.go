package node

// CommandAgentUpgrade asks the agent to replace its own binary with a release
// the core serves, then restart itself (docs/upgrades.md section 3); params
// are an [AgentUpgrade]. The agent answers ok once the new binary is in
// place and it is about to restart ("unchanged" in Detail when it already
// runs Version), or an error: agent_downgrade, digest_mismatch,
// release_not_found, upgrade_in_progress, upgrade_failed.
const CommandAgentUpgrade = "agent_upgrade"

// AgentUpgrade is the params of agent_upgrade. Program is the binary to
// replace: "berth-agent" (or empty) for the agent itself, or
// "berth-plugin-<name>" for the node's runtime driver plugin or its network
// plugin, which the agent relaunches by restarting, its workloads recovered
// and their network restored (docs/upgrades.md section 3.5). Version is the
// target ("0.4.0"); Releases are the core's binaries of that version, one
// per platform, and the agent takes the one of its own OS and architecture;
// Force allows a downgrade.
type AgentUpgrade struct {
	Program  string        `json:"program,omitempty"`
	Version  string        `json:"version"`
	Releases []ReleaseFile `json:"releases"`
	Force    bool          `json:"force,omitempty"`
}

// ReleaseFile is one binary the core serves at GET /api/v1/releases/{sha256}
// (docs/api.md "Releases"): Name is the program ("berth-agent"), OS and Arch
// are Go's GOOS and GOARCH, SHA256 is 64 lower-case hex digits, Size bytes.
type ReleaseFile struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
	SHA256  string `json:"sha256"`
	Size    int64  `json:"size"`
}
