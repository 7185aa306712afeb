package ui

import (
	"bytes"
	"context"
	"errors"
	"html"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/sdk/client"
)

// The workload page's live log (docs/ui.md section 5): GET /ui/stream/logs/{id} follows the
// workload's output through the API's own followed log read (GET /api/v1/workloads/{id}/logs
// with follow=true, docs/logs.md section 7), streamed in process, and sends each batch of new
// lines as one SSE message the page appends to its output. Each message's id is the sequence
// number of its last line, so a browser that reconnects (Last-Event-ID) gets only what came
// after; the page's first render says where its lines end (?after=).

// logBatch is how many lines one SSE message of a log stream carries at most.
const logBatch = 256

// logStream serves a workload's live output as Server-Sent Events until the browser leaves,
// StreamMaxAge passes, or the API stops accepting the session. When the follow ends (the node
// went away, the workload stopped) it says so once in the output and follows again after a
// pause, with keep-alive comments meanwhile.
func (h *Handler) logStream(w http.ResponseWriter, r *http.Request, v *viewer) {
	id := r.PathValue("id")
	after, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
	if last, err := strconv.ParseInt(r.Header.Get("Last-Event-ID"), 10, 64); err == nil && last > after {
		after = last
	}
	ctx, flusher, done, ok := h.openStream(w, r, "berth workload log")
	if !ok {
		return
	}
	defer done()

	tick := time.NewTicker(h.cfg.StreamInterval)
	defer tick.Stop()
	retry := 5 * h.cfg.StreamInterval
	var lastNote string
	for ctx.Err() == nil {
		lines := make(chan node.LogLine, logBatch)
		ended := make(chan error, 1)
		fctx, stop := context.WithCancel(ctx)
		c, cctx := h.client(r.WithContext(fctx), v.Bearer)
		go func() {
			ended <- c.FollowWorkloadLogs(cctx, id, logTail, func(l node.LogLine) error {
				select {
				case lines <- l:
					return nil
				case <-fctx.Done():
					return fctx.Err()
				}
			})
		}()
		err := h.sendLog(ctx, w, flusher, tick.C, lines, ended, &after)
		stop()
		if ctx.Err() != nil {
			return
		}
		if client.IsCode(err, "unauthenticated") {
			_, _ = w.Write(sseEvent("", []byte(logSessionEnded)))
			flusher.Flush()
			return
		}
		note := "The live output ended; following again shortly."
		if err != nil {
			note = "The live output is unavailable: " + errText(err) + "; trying again shortly."
			if errors.Is(err, client.ErrLiveTailUnavailable) {
				note = "The node is not connected, so the output shown is what it shipped; trying again shortly."
			}
		}
		if note != lastNote {
			lastNote = note
			_, _ = w.Write(sseEvent("", []byte(`<span class="log-note" role="status">`+html.EscapeString(note)+"</span>\n")))
			flusher.Flush()
		}
		if !sleepStream(ctx, w, flusher, retry) {
			return
		}
	}
}

// sendLog writes the lines of one follow as SSE messages (batched: what has arrived by the
// time a message is written goes in it), skipping those at or below *after and moving it on,
// and keep-alive comments on tick. It returns the follow's end (nil when it ended by itself)
// or ctx's.
func (h *Handler) sendLog(ctx context.Context, w http.ResponseWriter, f http.Flusher, tick <-chan time.Time, lines <-chan node.LogLine, ended <-chan error, after *int64) error {
	batch := make([]node.LogLine, 0, logBatch)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil {
				return err
			}
			f.Flush()
		case err := <-ended:
			// The follow has ended: what it sent before its end is queued; write it first.
			for len(lines) > 0 {
				batch = keepNew(batch, <-lines, after)
			}
			if werr := h.writeLogBatch(w, f, batch, *after); werr != nil {
				return werr
			}
			return err
		case l := <-lines:
			batch = keepNew(batch[:0], l, after)
			for len(lines) > 0 && len(batch) < logBatch {
				batch = keepNew(batch, <-lines, after)
			}
			if err := h.writeLogBatch(w, f, batch, *after); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
}

// keepNew appends l to batch unless its sequence is at or below *after (sent already), and
// moves *after to it. A line without a sequence (a driver without a log writer) is kept.
func keepNew(batch []node.LogLine, l node.LogLine, after *int64) []node.LogLine {
	if l.Seq > 0 {
		if l.Seq <= *after {
			return batch
		}
		*after = l.Seq
	}
	return append(batch, l)
}

// writeLogBatch writes batch as one SSE message with id lastSeq (nothing for an empty batch).
func (h *Handler) writeLogBatch(w http.ResponseWriter, f http.Flusher, batch []node.LogLine, lastSeq int64) error {
	if len(batch) == 0 {
		return nil
	}
	var buf bytes.Buffer
	if err := h.pages["workload"].ExecuteTemplate(&buf, "loglines", batch); err != nil {
		return err
	}
	id := ""
	if lastSeq > 0 {
		id = strconv.FormatInt(lastSeq, 10)
	}
	if _, err := w.Write(sseEvent(id, buf.Bytes())); err != nil {
		return err
	}
	f.Flush()
	return nil
}

// sleepStream waits d, then sends a keep-alive comment; false when ctx ended or the browser
// went away.
func sleepStream(ctx context.Context, w http.ResponseWriter, f http.Flusher, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil {
		return false
	}
	f.Flush()
	return true
}

// logSessionEnded is appended to a live log whose session the API stopped accepting.
const logSessionEnded = `<span class="log-note bad" role="alert" id="session-ended">Your session ended. <a href="/ui/login">Log in again</a>.</span>` + "\n"

// sseEvent frames body as one unnamed SSE message with id (none when empty), keeping every
// line of body, its last newline included: appended to a pre, lines stay lines.
func sseEvent(id string, body []byte) []byte {
	var b bytes.Buffer
	if id != "" {
		b.WriteString("id: " + id + "\n")
	}
	for _, line := range strings.Split(string(body), "\n") {
		b.WriteString("data: ")
		b.WriteString(strings.TrimRight(line, "\r"))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	return b.Bytes()
}
