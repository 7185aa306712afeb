package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"regexp"
	"strings"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/services"
)

// bind decodes a required JSON body into v: Content-Type must be
// application/json, the body at most MaxBodyBytes, one JSON object (not null,
// an array, a string or a number) with no unknown fields and the right types
// (docs/api.md section 1.1).
func (s *Server) bind(c echo.Context, v any) error {
	return s.decode(c, v, false)
}

// bindOptional is bind, but an empty body leaves v as it is. A body that is
// not empty must still be a JSON object.
func (s *Server) bindOptional(c echo.Context, v any) error {
	return s.decode(c, v, true)
}

func (s *Server) decode(c echo.Context, v any, optional bool) error {
	r := c.Request()
	raw, err := io.ReadAll(io.LimitReader(r.Body, s.cfg.MaxBodyBytes+1))
	if err != nil {
		return problem(abierrors.BadRequest, "could not read the request body")
	}
	if int64(len(raw)) > s.cfg.MaxBodyBytes {
		return problem(abierrors.BodyTooLarge, fmt.Sprintf("request body is larger than %d bytes", s.cfg.MaxBodyBytes))
	}
	if len(bytes.TrimSpace(raw)) == 0 && optional {
		return nil
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return problem(abierrors.UnsupportedMedia, "request body must be application/json")
	}
	return decodeObject(raw, v)
}

// decodeObject decodes raw, which must hold exactly one JSON object, into v with no unknown
// fields. Every other JSON value (null, an array, a string, a number, a boolean) is refused
// before decoding, since encoding/json would take null as "leave v unchanged".
func decodeObject(raw []byte, v any) error {
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		if len(t) == 0 {
			return problem(abierrors.BadRequest, "request body is empty; a JSON object is required")
		}
		return problem(abierrors.BadRequest, "request body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return problem(abierrors.BadRequest, describeJSONError(err))
	}
	if dec.More() {
		return problem(abierrors.BadRequest, "request body must hold exactly one JSON value")
	}
	return nil
}

func describeJSONError(err error) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "body"
		}
		return fmt.Sprintf("field %q must be %s, not %s", field, te.Type.String(), te.Value)
	case errors.As(err, &se):
		return fmt.Sprintf("malformed JSON at byte %d", se.Offset)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	case errors.Is(err, io.EOF):
		return "request body is empty"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "malformed JSON: unexpected end of body"
	}
	return "malformed JSON body"
}

// labelKeyRE is a label key: label keys become document field names in the store, where "."
// and "$" are not allowed, so they are refused here rather than by the store.
var labelKeyRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9_/-]{0,61}[a-z0-9])?$`)

func checkName(kind, name string) error {
	if !services.ValidName(name) {
		return problem(abierrors.InvalidName, fmt.Sprintf("%s name %q must be a DNS label: 1 to 63 characters of a-z, 0-9 and '-', not starting or ending with '-'", kind, name))
	}
	return nil
}

func validateEnroll(hostname, region, address string, labels map[string]string) error {
	fail := func(format string, a ...any) error {
		return problem(abierrors.ValidationFailed, fmt.Sprintf(format, a...))
	}
	if hostname == "" || len(hostname) > 253 {
		return fail("hostname is required (at most 253 characters)")
	}
	if region != "" && !services.ValidName(region) {
		return fail("region %q must be a DNS label", region)
	}
	if net.ParseIP(address) == nil {
		return fail("address %q must be an IP address", address)
	}
	if len(labels) > 64 {
		return fail("at most 64 labels")
	}
	for k, v := range labels {
		if !labelKeyRE.MatchString(k) || len(v) > 63 {
			return fail("label %q=%q: keys are lower-case [a-z0-9_/-] (no dots), values at most 63 characters", k, v)
		}
	}
	return nil
}
