package deploy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/services"
)

// TypeDeployRefused is the event of a change to what a service runs that a service.apply
// policy refused (data: service, revision, cause, module, reason, actor).
const TypeDeployRefused = "deploy.refused"

// admit runs the service.apply bindings for next (not yet stored; cur is the stored service, nil
// when absent) with the change's cause in the input. A denial is answered as policy_denied
// wrapping a *policy.DeniedError; it is counted, recorded as a deploy.refused event, and, for an
// unattended cause, kept where the service's verdict shows it. It returns the policies'
// warnings. Without a policy engine everything is allowed.
func (d *Deployer) admit(ctx context.Context, ch Change, p *services.Project, cur, next *services.Service) ([]string, error) {
	if d.cfg.Policy == nil {
		return nil, nil
	}
	svcs, err := d.cfg.Catalog.ListServices(ctx, p)
	if err != nil {
		return nil, err
	}
	var old any
	if cur != nil {
		old = policy.ServiceObject(cur)
		next.Revision = cur.Revision
	}
	obj := *next
	obj.Project = p.Name
	in := abiwasm.PolicyInput{
		Hook: abiwasm.HookServiceApply, Actor: ch.PolicyActor, Cause: ch.Cause, Project: policy.Usage(p.Name, svcs, next.Name),
		Object: policy.Raw(policy.ServiceObject(&obj)), OldObject: policy.Raw(old),
	}
	v, err := d.cfg.Policy.Admit(ctx, p.Name, in)
	if err != nil {
		return nil, err
	}
	if v.Allowed {
		return v.Warnings, nil
	}
	de := &policy.DeniedError{Hook: in.Hook, Reasons: v.UniqueReasons(), Denials: v.Denials}
	d.refused(ctx, ch, cur, de)
	return v.Warnings, &abierrors.Error{Code: abierrors.PolicyDenied, Message: de.Error(), Err: de}
}

// refusalOf names the module and the reason a refusal shows: the first denying module, with its
// reasons joined by "; ".
func refusalOf(de *policy.DeniedError) (module, reason string) {
	if len(de.Denials) > 0 {
		return de.Denials[0].Module, strings.Join(de.Denials[0].Reasons, "; ")
	}
	return "unknown", strings.Join(de.Reasons, "; ")
}

// refused makes a refusal visible: the counter, the deploy.refused event, and for an unattended
// cause the refusal record the service's verdict shows. Each is best effort once the refusal is
// decided: a failure is logged and the refusal stands.
func (d *Deployer) refused(ctx context.Context, ch Change, cur *services.Service, de *policy.DeniedError) {
	d.refusals.WithLabelValues(string(ch.Cause)).Inc()
	module, reason := refusalOf(de)
	var rev int64
	var svcID string
	if cur != nil {
		rev, svcID = cur.Revision, cur.ID
	}
	log := d.log.With("project", ch.Project.Name, "service", ch.Service, "cause", ch.Cause, "module", module, "reason", reason, "revision", rev)
	if Unattended(ch.Cause) {
		log.Warn("change refused by policy; the service keeps what it runs")
	} else {
		log.Info("change refused by policy")
	}
	now := d.cfg.Now().UTC()
	if d.cfg.Events != nil {
		ev := events.Core(TypeDeployRefused, "", map[string]any{"service": ch.Project.Name + "/" + ch.Service, "revision": rev,
			"cause": string(ch.Cause), "module": module, "reason": reason, "actor": ch.Actor.Type + ":" + ch.Actor.ID}, now)
		if svcID != "" {
			ev.Subject = node.EventRef{Type: "service", ID: svcID}
			// One event per refused cause and revision: a change decided again over the same
			// revision (a retried push, a second pass) records it once.
			sum := sha256.Sum256([]byte(svcID + "/" + string(ch.Cause) + "/" + module + "/" + reason + "/" + strconv.FormatInt(rev, 10) + "/" + TypeDeployRefused))
			if Unattended(ch.Cause) {
				ev.ID = "evt_" + hex.EncodeToString(sum[:13])
			}
		} else {
			ev.Subject = node.EventRef{Type: "project", ID: ch.Project.ID} // the service does not exist yet
		}
		ev.ProjectID = ch.Project.ID
		if _, _, err := d.cfg.Events.Append(ctx, ev); err != nil {
			log.Warn("record the refusal event", "err", err)
		}
	}
	if svcID == "" || !Unattended(ch.Cause) {
		return
	}
	err := d.cfg.Runtime.PutRefusal(ctx, rollout.DeployRefusal{ServiceID: svcID, ServiceRevision: rev, Cause: string(ch.Cause),
		Module: module, Reason: reason, At: now})
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Warn("record the refusal for the verdict", "err", err)
	}
}
