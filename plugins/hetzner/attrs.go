package hetzner

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/sdk/provider"
)

// ResourceType is the type of the resources this plugin manages: one
// Hetzner Cloud server per Berth machine, its id the machine id.
const ResourceType = "hetzner.server"

// The labels every server the plugin creates carries.
const (
	LabelMachine = "berth-machine" // the machine id, also the server's name
	LabelManaged = "berth-managed" // "true": created by Berth, subject to the orphan sweep
)

// maxUserData is the API's limit on cloud-init user data.
const maxUserData = 32 << 10

// Attributes are a server's desired state (docs/plugins-hetzner.md
// section 3). ServerType, Image, Location and Labels are read back from the
// API; SSHKeys, Firewall, PlacementGroup and UserData take effect at create
// only and are kept by the plugin as applied. Only Labels change in place;
// a change of any other field needs a new machine and is refused by Plan.
type Attributes struct {
	ServerType string            `json:"server_type"`               // e.g. "cx22"
	Image      string            `json:"image"`                     // e.g. "ubuntu-24.04"
	Location   string            `json:"location"`                  // e.g. "fsn1"
	Labels     map[string]string `json:"labels,omitempty"`          // besides berth-machine and berth-managed
	SSHKeys    []string          `json:"ssh_keys,omitempty"`        // names or numeric ids, sorted
	Firewall   string            `json:"firewall,omitempty"`        // name or numeric id
	Placement  string            `json:"placement_group,omitempty"` // name or numeric id
	UserData   string            `json:"user_data,omitempty"`       // cloud-init, at most 32 KiB
}

// createOnly is the part of Attributes the API does not return.
type createOnly struct {
	SSHKeys   []string `json:"ssh_keys,omitempty"`
	Firewall  string   `json:"firewall,omitempty"`
	Placement string   `json:"placement_group,omitempty"`
	UserData  string   `json:"user_data,omitempty"`
}

func (a Attributes) createOnly() createOnly {
	return createOnly{SSHKeys: a.SSHKeys, Firewall: a.Firewall, Placement: a.Placement, UserData: a.UserData}
}

var (
	machineID  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	labelKey   = regexp.MustCompile(`^([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)
	labelValue = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$`)
	word       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// checkID checks a resource's type and machine id.
func checkID(typ, id string) error {
	if typ != ResourceType {
		return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("the hetzner provider manages %s, not %q", ResourceType, typ))
	}
	if !machineID.MatchString(id) {
		return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("machine id %q is not a DNS label (a-z, 0-9, -, at most 63): it becomes the server's name and label", id))
	}
	return nil
}

// parseAttrs decodes and checks attributes, returning them in canonical form
// (SSH keys sorted and unique, empty labels as none).
func parseAttrs(raw json.RawMessage) (Attributes, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage("{}")
	}
	var a Attributes
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return Attributes{}, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s attributes: %v", ResourceType, err))
	}
	var problems []string
	for name, v := range map[string]string{"server_type": a.ServerType, "image": a.Image, "location": a.Location} {
		if v == "" {
			problems = append(problems, name+" is required")
		} else if !word.MatchString(v) {
			problems = append(problems, fmt.Sprintf("%s %q is not a name", name, v))
		}
	}
	for name, v := range map[string]string{"firewall": a.Firewall, "placement_group": a.Placement} {
		if v != "" && !word.MatchString(v) {
			problems = append(problems, fmt.Sprintf("%s %q is not a name or id", name, v))
		}
	}
	for _, k := range a.SSHKeys {
		if strings.TrimSpace(k) == "" || len(k) > 128 {
			problems = append(problems, fmt.Sprintf("ssh key %q is not a name or id", k))
		}
	}
	for k, v := range a.Labels {
		switch {
		case k == LabelMachine || k == LabelManaged:
			problems = append(problems, fmt.Sprintf("label %s is set by the plugin itself", k))
		case !labelKey.MatchString(k):
			problems = append(problems, fmt.Sprintf("label key %q is not valid (letters, digits, . _ -, at most 63, optional DNS prefix/)", k))
		case !labelValue.MatchString(v):
			problems = append(problems, fmt.Sprintf("label %s=%q: value is not valid (letters, digits, . _ -, at most 63)", k, v))
		}
	}
	if len(a.UserData) > maxUserData {
		problems = append(problems, fmt.Sprintf("user_data is %d bytes; the API takes at most %d", len(a.UserData), maxUserData))
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return Attributes{}, abierrors.New(abierrors.ValidationFailed, ResourceType+": "+strings.Join(problems, "; "))
	}
	if len(a.Labels) == 0 {
		a.Labels = nil
	}
	if len(a.SSHKeys) == 0 {
		a.SSHKeys = nil
	} else {
		a.SSHKeys = slices.Compact(slices.Sorted(slices.Values(a.SSHKeys)))
	}
	return a, nil
}

// resource is the resource of machine id with attributes a.
func resource(id string, a Attributes) provider.Resource {
	raw, _ := json.Marshal(a) // plain struct: cannot fail
	return provider.Resource{Type: ResourceType, ID: id, Attributes: raw}
}

// serverLabels are the labels a server of machine id with attributes a carries.
func serverLabels(id string, a Attributes) map[string]string {
	out := map[string]string{LabelMachine: id, LabelManaged: "true"}
	for k, v := range a.Labels {
		out[k] = v
	}
	return out
}

// userLabels are the labels of a server other than the plugin's own; nil
// when none.
func userLabels(l map[string]string) map[string]string {
	var out map[string]string
	for k, v := range l {
		if k == LabelMachine || k == LabelManaged {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out
}
