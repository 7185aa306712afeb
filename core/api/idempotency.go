package api

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/idempotency"
	"github.com/berthhq/berth/core/store"
	"github.com/labstack/echo/v4"
)

// Idempotency-Key handling of every mutating /api/v1 endpoint (docs/api.md section 1.7).
const (
	// HeaderIdempotencyKey names the request header that makes a mutating request replayable.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderIdempotencyReplayed is set to "true" on an answer replayed from the record.
	HeaderIdempotencyReplayed = "Idempotency-Replayed"
	// MaxIdempotencyKeyBytes bounds the key: 1 to 200 bytes of printable ASCII.
	MaxIdempotencyKeyBytes = 200
	// IdempotencyTTL is how long a recorded answer is replayed; the sweep deletes older records
	// and a lookup treats them as absent.
	IdempotencyTTL = 24 * time.Hour
	// IdempotencyClaimTimeout is how long a claim whose request has not answered holds the key:
	// a later request with the key answers 409 idempotency_key_in_flight until then, and may
	// take the claim over afterwards (the process that held it died).
	IdempotencyClaimTimeout = 2 * time.Minute
	// DefaultIdempotencySweepInterval is how often [Server.RunIdempotencySweep] deletes expired
	// records when given zero.
	DefaultIdempotencySweepInterval = time.Hour
)

// maxRecordedAnswer bounds an answer body the record keeps; a larger 2xx answer is not recorded
// (the key is released) and is logged.
const maxRecordedAnswer = 1 << 20

func (s *Server) now() time.Time {
	if s.cfg.Now != nil {
		return s.cfg.Now().UTC()
	}
	return time.Now().UTC()
}

// mutating reports whether method changes state.
func mutating(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// validIdempotencyKey reports whether k is 1 to MaxIdempotencyKeyBytes of printable ASCII.
func validIdempotencyKey(k string) bool {
	if k == "" || len(k) > MaxIdempotencyKeyBytes {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// idempotent runs next at most once per (bearer, method, route, Idempotency-Key) within
// IdempotencyTTL (docs/api.md section 1.7). The auth middleware calls it for every mutating
// route after the bearer was checked; a request without the header runs next as it is, and
// one with an empty, repeated or malformed header is 400 bad_request.
//
//  1. The body is read whole (a JSON body up to MaxBodyBytes, an upload spooled to a temporary
//     file up to its route's limit) and digested with the method, path, query and content type.
//  2. The key is claimed by inserting a pending record under its _id. A duplicate means the
//     key was seen: another request digest answers 422 idempotency_key_reused; a pending claim
//     answers 409 idempotency_key_in_flight; a recorded answer is replayed with its status,
//     content type and body and Idempotency-Replayed: true. An expired record, or a claim older
//     than IdempotencyClaimTimeout, is taken over by a compare-and-set on its claim.
//  3. next runs once; a 2xx answer is recorded (compare-and-set on the claim). Any other answer
//     is a refusal or a fault: the claim is deleted (compare-and-set on the claim), so that a
//     refused request leaves no trace and a retry after a fault runs again and can succeed.
func (s *Server) idempotent(bearer string, next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		keys := r.Header.Values(HeaderIdempotencyKey)
		if len(keys) == 0 || !mutating(r.Method) {
			return next(c)
		}
		key := keys[0]
		if len(keys) > 1 || !validIdempotencyKey(key) {
			// An empty or repeated header is no key: running as if absent would drop it silently.
			return problem(abierrors.BadRequest, fmt.Sprintf("%s must be one header of 1 to %d printable ASCII characters", HeaderIdempotencyKey, MaxIdempotencyKeyBytes))
		}
		seal := sha256.Sum256([]byte("berth.idempotency.seal.v1\x00" + bearer + "\x00" + key))
		digest, cleanup, err := s.digestRequest(c, seal[:])
		if err != nil {
			return err
		}
		defer cleanup()
		id := idempotencyID(bearer, r.Method, c.Path(), key)

		claim, err := s.claimKey(c, id, digest, seal[:])
		if err != nil || claim == "" {
			return err // a refusal, or nil after a replay
		}
		return s.runClaimed(c, next, id, claim, seal[:])
	}
}

// idempotencyID is the _id of the record of key sent by bearer to route (echo's pattern, e.g.
// "/api/v1/projects/:project/services/:name") with method: the hex SHA-256 of the bearer's
// SHA-256, the method, the route and the key.
func idempotencyID(bearer, method, route, key string) string {
	sum := sha256.Sum256([]byte(bearer))
	h := sha256.New()
	for _, p := range []string{"berth.idempotency.v1", hex.EncodeToString(sum[:]), method, route, key} {
		_, _ = io.WriteString(h, p)
		_, _ = h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// digestRequest reads the request body, puts an equal one back for the handler and returns the
// digest of the request: HMAC-SHA-256 under key (derived from the bearer and the
// Idempotency-Key, neither stored), so that the stored digest of a body holding a secret value
// cannot be checked against guesses of the value. cleanup removes a spooled upload.
func (s *Server) digestRequest(c echo.Context, key []byte) (string, func(), error) {
	r := c.Request()
	h := hmac.New(sha256.New, key)
	for _, p := range []string{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type")} {
		_, _ = io.WriteString(h, p)
		_, _ = h.Write([]byte{0})
	}
	nop := func() {}
	if routeBody(c) == bodyUpload {
		limit := s.uploadLimit(c)
		if limit <= 0 {
			return hex.EncodeToString(h.Sum(nil)), nop, nil // refused before the body is read
		}
		f, err := os.CreateTemp("", "berth-idempotent-upload-*")
		if err != nil {
			return "", nop, fmt.Errorf("spool upload: %w", err)
		}
		cleanup := func() { _ = f.Close(); _ = os.Remove(f.Name()) }
		n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r.Body, limit+1))
		if err != nil {
			cleanup()
			return "", nop, problem(abierrors.BadRequest, "could not read the request body")
		}
		if n > limit {
			cleanup()
			return "", nop, problem(abierrors.BodyTooLarge, fmt.Sprintf("upload is larger than the limit of %d bytes", limit))
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			cleanup()
			return "", nop, fmt.Errorf("spool upload: %w", err)
		}
		r.Body, r.ContentLength = f, n
		return hex.EncodeToString(h.Sum(nil)), cleanup, nil
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, s.cfg.MaxBodyBytes+1))
	if err != nil {
		return "", nop, problem(abierrors.BadRequest, "could not read the request body")
	}
	if int64(len(raw)) > s.cfg.MaxBodyBytes {
		return "", nop, problem(abierrors.BodyTooLarge, fmt.Sprintf("request body is larger than %d bytes", s.cfg.MaxBodyBytes))
	}
	_, _ = h.Write(raw)
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(raw)), int64(len(raw))
	return hex.EncodeToString(h.Sum(nil)), nop, nil
}

// uploadLimit is the largest upload the route of c accepts; zero when the route serves none
// (modules without a policy engine refuse before reading).
func (s *Server) uploadLimit(c echo.Context) int64 {
	if c.Path() == "/api/v1/modules" {
		if s.cfg.Policy != nil {
			return s.cfg.Policy.MaxModuleBytes()
		}
		return 0
	}
	return s.cfg.Bundles.MaxBytes()
}

// claimKey claims id for this request and returns the claim; "" with a nil error means an
// answer was replayed, and an error is the refusal to return. A round that saw the record change
// under it is tried again as [store.RetryOnConflict] says.
func (s *Server) claimKey(c echo.Context, id, digest string, seal []byte) (string, error) {
	ctx := context.WithoutCancel(c.Request().Context())
	recs := s.cfg.Idempotency
	var claimed string
	err := store.RetryOnConflict(ctx, func() error {
		now := s.now()
		claim := rand.Text()
		fresh := idempotency.Record{ID: id, Claim: claim, State: idempotency.Pending, Request: digest, ClaimedAt: now, ExpiresAt: now.Add(IdempotencyTTL)}
		err := recs.Insert(ctx, fresh)
		if err == nil {
			claimed = claim
			return nil
		}
		if !errors.Is(err, idempotency.ErrClaimed) {
			return fmt.Errorf("claim idempotency key: %w", err)
		}
		rec, err := recs.Get(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("claim idempotency key: swept between the insert and the read: %w", store.ErrConflict)
		}
		if err != nil {
			return fmt.Errorf("read idempotency record: %w", err)
		}
		stale := !now.Before(rec.ExpiresAt) || (rec.State == idempotency.Pending && now.Sub(rec.ClaimedAt) >= IdempotencyClaimTimeout)
		switch {
		case stale:
			ok, err := recs.TakeOver(ctx, id, rec.Claim, fresh)
			if err != nil {
				return fmt.Errorf("take over idempotency key: %w", err)
			}
			if !ok {
				return fmt.Errorf("take over idempotency key: taken over meanwhile: %w", store.ErrConflict)
			}
			claimed = claim
			return nil
		case rec.Request != digest:
			return problem(abierrors.IdempotencyKeyReused, "this Idempotency-Key was used with another request (method, path, query or body)")
		case rec.State == idempotency.Pending:
			c.Response().Header().Set("Retry-After", "1")
			return problem(abierrors.IdempotencyKeyInFlight, "the first request with this Idempotency-Key has not answered yet; retry shortly")
		default:
			return s.replay(c, rec, seal) // claimed stays "": answered
		}
	})
	if errors.Is(err, store.ErrRetriesExhausted) {
		c.Response().Header().Set("Retry-After", "1")
		return "", problem(abierrors.IdempotencyKeyInFlight, "this Idempotency-Key is changing hands; retry shortly")
	}
	if err != nil {
		return "", err
	}
	return claimed, nil
}

// replay writes the recorded answer of rec.
func (s *Server) replay(c echo.Context, rec *idempotency.Record, seal []byte) error {
	body, err := unseal(seal, rec.ID, rec.Sealed)
	if err != nil {
		return fmt.Errorf("replay idempotency record %s: %w", rec.ID, err)
	}
	h := c.Response().Header()
	h.Set(HeaderIdempotencyReplayed, "true")
	if rec.ContentType != "" {
		h.Set(echo.HeaderContentType, rec.ContentType)
	}
	c.Response().WriteHeader(rec.Status)
	if len(body) > 0 && c.Request().Method != http.MethodHead {
		_, _ = c.Response().Write(body)
	}
	return nil
}

// runClaimed runs next under claim and records or releases the claim by its answer.
func (s *Server) runClaimed(c echo.Context, next echo.HandlerFunc, id, claim string, seal []byte) error {
	ctx := context.WithoutCancel(c.Request().Context())
	res := c.Response()
	rec := &answerRecorder{ResponseWriter: res.Writer}
	res.Writer = rec
	settled := false
	release := func() {
		// The refused request changed nothing, and neither does its claim: it is deleted, unless
		// another request took it over meanwhile.
		if _, err := s.cfg.Idempotency.Release(ctx, id, claim); err != nil {
			s.log.Warn("idempotency key not released; it frees itself after the claim timeout", "err", err)
		}
	}
	defer func() {
		if !settled { // next panicked
			release()
		}
	}()
	if err := next(c); err != nil {
		c.Error(err) // the answer is written here so that it can be recorded
	}
	settled = true
	status := res.Status
	if status < 200 || status > 299 || rec.overflow {
		if rec.overflow {
			s.log.Warn("answer too large to record for its Idempotency-Key; a retry runs again", "path", c.Request().URL.Path, "bytes", rec.buf.Len())
		}
		release()
		return nil
	}
	sealed, err := sealAnswer(seal, id, rec.buf.Bytes())
	if err == nil {
		var ok bool
		ok, err = s.cfg.Idempotency.Settle(ctx, id, claim, status, res.Header().Get(echo.HeaderContentType), sealed)
		if err == nil && !ok {
			err = errors.New("the claim was taken over")
		}
	}
	if err != nil {
		// The answer was sent; a retry with the key waits for the claim timeout and runs again.
		s.log.Warn("answer of an idempotent request not recorded", "path", c.Request().URL.Path, "err", err)
	}
	return nil
}

// answerRecorder passes an answer through and keeps a copy of up to maxRecordedAnswer bytes.
type answerRecorder struct {
	http.ResponseWriter
	buf      bytes.Buffer
	overflow bool
}

func (a *answerRecorder) Write(p []byte) (int, error) {
	if !a.overflow {
		if a.buf.Len()+len(p) > maxRecordedAnswer {
			a.overflow = true
			a.buf.Reset()
		} else {
			a.buf.Write(p)
		}
	}
	return a.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection.
func (a *answerRecorder) Unwrap() http.ResponseWriter { return a.ResponseWriter }

func sealAnswer(key []byte, id string, body []byte) ([]byte, error) {
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal answer: %w", err)
	}
	return aead.Seal(nonce, nonce, body, []byte(id)), nil
}

func unseal(key []byte, id string, sealed []byte) ([]byte, error) {
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	if len(sealed) < aead.NonceSize() {
		return nil, errors.New("sealed answer too short")
	}
	out, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], []byte(id))
	if err != nil {
		return nil, fmt.Errorf("open sealed answer: %w", err)
	}
	return out, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("answer cipher: %w", err)
	}
	return cipher.NewGCM(b)
}

// SweepIdempotency deletes the Idempotency-Key records that expired by now and returns how many.
// It reads the whole collection on the embedded store, so it runs periodically
// ([Server.RunIdempotencySweep]), never per request; lookups treat an expired record as absent
// whether or not it was swept yet. Safe to run from several processes.
func (s *Server) SweepIdempotency(ctx context.Context) (int64, error) {
	return s.cfg.Idempotency.Sweep(ctx, s.now())
}

// IdempotencySweepPass deletes the expired idempotency records once (berthd runs it as the
// platform task "idempotency.expiry" every DefaultIdempotencySweepInterval) and returns that
// interval as the wait before the next pass.
func (s *Server) IdempotencySweepPass(ctx context.Context) (time.Duration, error) {
	n, err := s.SweepIdempotency(ctx)
	if err == nil && n > 0 {
		s.log.Info("expired idempotency records swept", "count", n)
	}
	return DefaultIdempotencySweepInterval, err
}
