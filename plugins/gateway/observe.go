package gateway

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// RequestIDHeader carries a request's id to the upstream and back to the
// client (docs/plugins.md section 5.5).
const RequestIDHeader = "X-Request-Id"

// maxRequestIDLen is the longest client-sent request id the gateway keeps;
// a longer one, or one with bytes outside printable ASCII, is replaced.
const maxRequestIDLen = 128

// requestIDs makes request ids: a random per-process prefix and a counter,
// 32 hex digits, unique without a random read per request.
type requestIDs struct {
	prefix [8]byte
	n      atomic.Uint64
}

func newRequestIDs() *requestIDs {
	ids := &requestIDs{}
	_, _ = rand.Read(ids.prefix[:]) // never fails (crypto/rand)
	return ids
}

// forRequest returns r's request id, keeping the client's when usable and
// otherwise making one; r then carries exactly that one id. The id is also
// returned as a header value, which r's header holds and the response may
// share.
func (ids *requestIDs) forRequest(r *http.Request) (string, []string) {
	if vs := r.Header[RequestIDHeader]; len(vs) == 1 && usableRequestID(vs[0]) {
		return vs[0], vs
	}
	var buf [32]byte
	hex.Encode(buf[:16], ids.prefix[:])
	n := ids.n.Add(1)
	var c [8]byte
	for i := range c {
		c[7-i] = byte(n >> (8 * i))
	}
	hex.Encode(buf[16:], c[:])
	vs := []string{string(buf[:])}
	r.Header[RequestIDHeader] = vs
	return vs[0], vs
}

func usableRequestID(s string) bool {
	if s == "" || len(s) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// recorder is the ResponseWriter a request is served through: it notes what
// the access log and the metrics need, collects the error of a failed
// attempt at an upstream (set by the reverse proxy's ErrorHandler), and
// flushes a body of known length that is still incomplete after a write at
// most bufferedFlush later.
type recorder struct {
	w     http.ResponseWriter
	id    string
	idVal []string // id as a header value, shared by request and response
	start time.Time
	// service ("project/service") and upstream (address) of the route
	// and the last upstream tried; empty when there was none.
	service, upstream string
	route             *route    // the route matched; nil when none
	up                *upstream // the last upstream tried; nil when none
	status            int       // final status; 0 while none was written
	bytes             int64
	// declared is the final response's Content-Length, -1 when it has
	// none.
	declared       int64
	trickle        *delayedFlush // made by the first write that leaves a body incomplete
	err            error         // of the attempt under way
	upstreamErrors int
	retries        int
	// line is the access log line's buffer, kept across requests.
	line []byte
}

var recorders = sync.Pool{New: func() any { return new(recorder) }}

func getRecorder(w http.ResponseWriter) *recorder {
	rec := recorders.Get().(*recorder)
	*rec = recorder{w: w, declared: -1, line: rec.line}
	return rec
}

// putRecorder stops the recorder's delayed flush, if any, before the
// response is finished, and recycles it.
func putRecorder(rec *recorder) {
	if rec.trickle != nil {
		rec.trickle.stop()
	}
	line := rec.line
	if cap(line) > 4<<10 { // one long line does not stay pooled
		line = nil
	}
	*rec = recorder{line: line[:0]}
	recorders.Put(rec)
}

// Header implements http.ResponseWriter.
func (rec *recorder) Header() http.Header { return rec.w.Header() }

// WriteHeader implements http.ResponseWriter. The final status (or 101
// Switching Protocols, after which the connection is the upstream's) adds
// the request id to the response unless the upstream set one.
func (rec *recorder) WriteHeader(code int) {
	if (code >= 200 || code == http.StatusSwitchingProtocols) && rec.status == 0 {
		rec.status = code
		h := rec.w.Header()
		if _, ok := h[RequestIDHeader]; !ok {
			if rec.idVal == nil {
				rec.idVal = []string{rec.id}
			}
			h[RequestIDHeader] = rec.idVal
		}
		if vs := h["Content-Length"]; len(vs) == 1 {
			if n, err := strconv.ParseInt(vs[0], 10, 64); err == nil && n >= 0 {
				rec.declared = n
			}
		}
	}
	rec.w.WriteHeader(code)
}

// Write implements http.ResponseWriter. A write that leaves a body of known
// length incomplete arms a flush bufferedFlush later (unless one is armed):
// the rest may be slow to come. A body that arrives whole is never flushed
// here; the server writes it in one piece at the end of the request.
func (rec *recorder) Write(b []byte) (int, error) {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.trickle != nil {
		n, err := rec.trickle.write(b, rec.declared < 0 || rec.bytes+int64(len(b)) < rec.declared)
		rec.bytes += int64(n)
		return n, err
	}
	n, err := rec.w.Write(b)
	rec.bytes += int64(n)
	if err == nil && rec.declared > rec.bytes {
		rec.trickle = &delayedFlush{w: rec.w}
		rec.trickle.arm()
	}
	return n, err
}

// Flush implements http.Flusher.
func (rec *recorder) Flush() {
	if rec.trickle != nil {
		rec.trickle.flush()
		return
	}
	flushWriter(rec.w)
}

// flushWriter flushes w, the server's ResponseWriter.
func flushWriter(w http.ResponseWriter) {
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
		return
	}
	_ = http.NewResponseController(w).Flush()
}

// delayedFlush flushes a ResponseWriter at most bufferedFlush after a
// write, from a timer; from its creation on, every write and flush of the
// response goes through it, under its lock.
type delayedFlush struct {
	w http.ResponseWriter

	mu      sync.Mutex
	t       *time.Timer // mu must be held
	pending bool        // a flush is armed; mu must be held
	stopped bool        // the request is over; mu must be held
}

// write writes b and, when more is to come (incomplete), arms a flush.
func (d *delayedFlush) write(b []byte, incomplete bool) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, err := d.w.Write(b)
	if incomplete {
		d.armLocked()
	}
	return n, err
}

func (d *delayedFlush) arm() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armLocked()
}

// armLocked arms a flush unless one is pending. mu must be held.
func (d *delayedFlush) armLocked() {
	if d.pending || d.stopped {
		return
	}
	d.pending = true
	if d.t == nil {
		d.t = time.AfterFunc(bufferedFlush, d.fire)
		return
	}
	d.t.Reset(bufferedFlush)
}

func (d *delayedFlush) fire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.pending || d.stopped {
		return
	}
	d.pending = false
	flushWriter(d.w)
}

// flush flushes now (the reverse proxy asks for it).
func (d *delayedFlush) flush() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return
	}
	d.pending = false
	flushWriter(d.w)
}

// stop ends the delayed flushes: the request is over and its writer may no
// longer be used.
func (d *delayedFlush) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	d.pending = false
	if d.t != nil {
		d.t.Stop()
	}
}

// Unwrap lets http.ResponseController reach the connection's writer
// (flushes, hijacking for upgraded connections, deadlines).
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.w }

// numClasses is the number of status classes: 1xx to 5xx and none.
const numClasses = 6

// classIndex is the index of status's class: 0 to 4 for 1xx to 5xx, 5 when
// no status was written (the client went away first).
func classIndex(status int) int {
	if status >= 100 && status < 600 {
		return status/100 - 1
	}
	return numClasses - 1
}

// codeClass is the bounded status label of class index i: 1xx to 5xx, or
// "none".
func codeClass(i int) string {
	switch i {
	case 0:
		return "1xx"
	case 1:
		return "2xx"
	case 2:
		return "3xx"
	case 3:
		return "4xx"
	case 4:
		return "5xx"
	}
	return "none"
}

// seriesCache holds metric series by status class, each looked up in its
// vector on first use and then used without a lookup: requests of a route
// and an upstream of the table in force count with one atomic load and
// one atomic add.
type seriesCache[T any] [numClasses]atomic.Pointer[T]

// get returns the series of class i, looked up by lookup on first use.
func (c *seriesCache[T]) get(i int, lookup func() T) T {
	if s := c[i].Load(); s != nil {
		return *s
	}
	s := lookup()
	c[i].Store(&s)
	return s
}

// Label values for requests that matched no route or reached no upstream.
const (
	noService  = "-"
	noUpstream = "-"
)

// observer counts requests and writes the access log. Its label sets are
// bounded by the route table: services and upstreams are taken from it
// (never from a client's Host header), and the series of those that leave
// the table are deleted (docs/plugins.md section 5.5).
type observer struct {
	requests       *prometheus.CounterVec   // service, code_class, upstream
	duration       *prometheus.HistogramVec // service, code_class
	upstreamErrors *prometheus.CounterVec   // service, upstream, kind
	retries        *prometheus.CounterVec   // service
	handshakes     *prometheus.CounterVec   // reason
	passthrough    *prometheus.CounterVec   // service, result
	certsRefused   prometheus.Counter
	certs          prometheus.Gauge
	log            *accessLog // nil: no access log

	mu    sync.Mutex
	known map[[2]string]bool // (service, upstream) pairs of the current table; mu must be held
	// passthroughSeen are the services of the current table. mu must be held.
	passthroughSeen []string
}

func newObserver(reg prometheus.Registerer, access io.Writer, logger *slog.Logger) *observer {
	o := &observer{known: map[[2]string]bool{}}
	if access != nil {
		o.log = newAccessLog(access, logger)
	}
	if reg == nil {
		return o
	}
	o.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_gateway_requests_total",
		Help: "Requests the gateway answered, by service (project/name, '-' without a route), status class and upstream address ('-' when none answered).",
	}, []string{"service", "code_class", "upstream"})
	o.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "berth_gateway_request_duration_seconds",
		Help:    "Time from a request's arrival to the end of its response, by service and status class.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 12), // 0.5 ms to about 12 s
	}, []string{"service", "code_class"})
	o.upstreamErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_gateway_upstream_errors_total",
		Help: "Failed attempts at an upstream, by service, upstream address and kind (timeout, refused, other).",
	}, []string{"service", "upstream", "kind"})
	o.retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_gateway_upstream_retries_total",
		Help: "Requests sent again to another upstream after a failed attempt, by service.",
	}, []string{"service"})
	o.handshakes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_gateway_tls_handshake_failures_total",
		Help: "TLS handshakes the gateway refused, by reason (no_route, no_certificate, no_sni, bad_hello).",
	}, []string{"reason"})
	for _, r := range []string{failNoRoute, failNoCertificate, failNoSNI, failBadHello} {
		o.handshakes.WithLabelValues(r)
	}
	o.passthrough = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_gateway_passthrough_connections_total",
		Help: "TLS connections relayed by SNI without termination, by service and result (relayed, source_not_allowed, no_upstream).",
	}, []string{"service", "result"})
	o.certsRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "berth_gateway_certificates_refused_total",
		Help: "Certificates of route tables the gateway could not use (PEM that does not parse, a key that does not match).",
	})
	o.certs = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "berth_gateway_certificates",
		Help: "Certificates in the route table in force.",
	})
	reg.MustRegister(o.requests, o.duration, o.upstreamErrors, o.retries, o.handshakes, o.passthrough, o.certsRefused, o.certs)
	return o
}

// handshakeFailed counts one refused TLS handshake.
func (o *observer) handshakeFailed(reason string) {
	if o.handshakes != nil {
		o.handshakes.WithLabelValues(reason).Inc()
	}
}

// passthroughDone counts one passthrough connection of service by result.
func (o *observer) passthroughDone(service, result string) {
	if o.passthrough != nil {
		o.passthrough.WithLabelValues(service, result).Inc()
	}
}

// certificateRefused counts one certificate of a table that could not be used.
func (o *observer) certificateRefused() {
	if o.certsRefused != nil {
		o.certsRefused.Inc()
	}
}

// certificatesInForce sets the number of certificates in the table in force.
func (o *observer) certificatesInForce(n int) {
	if o.certs != nil {
		o.certs.Set(float64(n))
	}
}

// done records one finished request.
func (o *observer) done(rec *recorder, r *http.Request) {
	elapsed := time.Since(rec.start)
	if o.requests != nil {
		o.count(rec, elapsed)
	}
	if o.log != nil {
		o.log.write(rec, r, elapsed)
	}
}

// count adds a finished request to the metrics; a request of a route of
// the table uses the series cached on the route and its upstream.
func (o *observer) count(rec *recorder, elapsed time.Duration) {
	ci := classIndex(rec.status)
	class := codeClass(ci)
	rt := rec.route
	if rt == nil {
		o.requests.WithLabelValues(noService, class, noUpstream).Inc()
		o.duration.WithLabelValues(noService, class).Observe(elapsed.Seconds())
		return
	}
	if rec.up == nil || rec.err != nil {
		rt.noUpstreamRequests.get(ci, func() prometheus.Counter {
			return o.requests.WithLabelValues(rt.service, class, noUpstream)
		}).Inc()
	} else {
		u := rec.up
		u.requests.get(ci, func() prometheus.Counter {
			return o.requests.WithLabelValues(rt.service, class, u.Address)
		}).Inc()
	}
	rt.durations.get(ci, func() prometheus.Observer {
		return o.duration.WithLabelValues(rt.service, class)
	}).Observe(elapsed.Seconds())
	if rec.retries > 0 {
		o.retries.WithLabelValues(rt.service).Add(float64(rec.retries))
	}
}

// refused reports whether err is a refused connection.
func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// upstreamError counts one failed attempt at upstream.
func (o *observer) upstreamError(service, upstream string, err error) {
	if o.upstreamErrors == nil {
		return
	}
	kind := "other"
	switch {
	case timedOut(err):
		kind = "timeout"
	case refused(err):
		kind = "refused"
	}
	o.upstreamErrors.WithLabelValues(service, upstream, kind).Inc()
}

// tableChanged deletes the series of services and upstreams that left the
// table, so that label sets stay bounded by the table in force.
func (o *observer) tableChanged(c *compiled) {
	if o.requests == nil {
		return
	}
	now := map[[2]string]bool{}
	services := map[string]bool{}
	for _, vh := range c.byHost {
		for _, rt := range vh.routes {
			services[rt.service] = true
			for _, u := range rt.healthy {
				now[[2]string{rt.service, u.Address}] = true
			}
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for k := range o.known {
		if now[k] {
			continue
		}
		o.requests.DeletePartialMatch(prometheus.Labels{"service": k[0], "upstream": k[1]})
		o.upstreamErrors.DeletePartialMatch(prometheus.Labels{"service": k[0], "upstream": k[1]})
		if !services[k[0]] {
			o.requests.DeletePartialMatch(prometheus.Labels{"service": k[0]})
			o.duration.DeletePartialMatch(prometheus.Labels{"service": k[0]})
			o.retries.DeletePartialMatch(prometheus.Labels{"service": k[0]})
		}
	}
	// Passthrough series go with their service, healthy upstreams or not.
	for _, svc := range o.passthroughSeen {
		if !services[svc] {
			o.passthrough.DeletePartialMatch(prometheus.Labels{"service": svc})
		}
	}
	o.passthroughSeen = o.passthroughSeen[:0]
	for svc := range services {
		o.passthroughSeen = append(o.passthroughSeen, svc)
	}
	o.known = now
}

func (o *observer) close() error {
	if o.log == nil {
		return nil
	}
	return o.log.close()
}

// accessLog writes one JSON line per request. A request formats its line
// and appends it to a batch under a short lock; a background goroutine
// hands the batch to the writer every accessLogFlush, or as soon as it
// holds accessLogBatch bytes, so that no request waits for the file. A
// crash loses at most a second of the log. When the writer falls behind
// by accessLogMaxPending bytes, requests write the batch themselves, which
// bounds the memory held.
type accessLog struct {
	logger *slog.Logger
	w      io.Writer

	mu      sync.Mutex
	pending []byte // lines not handed to w yet; mu must be held
	spare   []byte // the previous batch's buffer, for reuse; mu must be held
	closed  bool   // close ran: write through; mu must be held

	wmu    sync.Mutex // serialises writes to w
	failed bool       // a write failed and was logged; wmu must be held

	kick chan struct{} // a batch is full (capacity 1)
	stop chan struct{} // closed by close
	done chan struct{}
}

// Batching of the access log.
const (
	// accessLogFlush is how often the batch is written out.
	accessLogFlush = time.Second
	// accessLogBatch is the batch size that has it written at once.
	accessLogBatch = 64 << 10
	// accessLogMaxPending is the batch size at which requests write it
	// themselves: the writer is not keeping up.
	accessLogMaxPending = 4 << 20
)

func newAccessLog(w io.Writer, logger *slog.Logger) *accessLog {
	l := &accessLog{logger: logger, w: w, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go l.flusher()
	return l
}

func (l *accessLog) flusher() {
	defer close(l.done)
	t := time.NewTicker(accessLogFlush)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		case <-l.kick:
		}
		l.writeOut()
	}
}

// writeOut hands the pending batch to the writer.
func (l *accessLog) writeOut() error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	batch := l.pending
	l.pending, l.spare = l.spare[:0], nil
	l.mu.Unlock()
	var err error
	if len(batch) > 0 {
		if _, err = l.w.Write(batch); err != nil && !l.failed {
			l.failed = true
			l.logger.Error("gateway: access log write failed; later failures are not logged", "error", err)
		}
	}
	l.mu.Lock()
	if cap(batch) <= 2*accessLogBatch { // a batch swollen by a slow writer is let go
		l.spare = batch[:0]
	}
	l.mu.Unlock()
	return err
}

func (l *accessLog) write(rec *recorder, r *http.Request, elapsed time.Duration) {
	b := rec.line[:0]
	b = append(b, `{"time":"`...)
	b = rec.start.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","host":`...)
	b = appendJSONString(b, r.Host)
	b = append(b, `,"method":`...)
	b = appendJSONString(b, r.Method)
	b = append(b, `,"path":`...)
	b = appendJSONString(b, r.URL.Path) // never the query: it may carry credentials
	b = append(b, `,"proto":`...)
	b = appendJSONString(b, r.Proto)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(rec.status), 10)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendInt(b, rec.bytes, 10)
	b = append(b, `,"duration_ms":`...)
	b = strconv.AppendFloat(b, float64(elapsed.Microseconds())/1000, 'f', 3, 64)
	b = append(b, `,"service":`...)
	b = appendJSONString(b, rec.service)
	b = append(b, `,"upstream":`...)
	b = appendJSONString(b, rec.upstream)
	b = append(b, `,"request_id":`...)
	b = appendJSONString(b, rec.id)
	b = append(b, `,"remote_addr":`...)
	b = appendJSONString(b, r.RemoteAddr)
	b = append(b, "}\n"...)
	rec.line = b
	l.mu.Lock()
	l.pending = append(l.pending, b...)
	n, closed := len(l.pending), l.closed
	l.mu.Unlock()
	switch {
	case closed || n >= accessLogMaxPending: // write through
		_ = l.writeOut()
	case n >= accessLogBatch:
		select {
		case l.kick <- struct{}{}:
		default: // the flusher has been told already
		}
	}
}

func (l *accessLog) close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.stop)
	l.mu.Unlock()
	<-l.done
	return l.writeOut()
}

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced by U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
