package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
)

const (
	mediaJSON       = "application/json"
	mediaURLEncoded = "application/x-www-form-urlencoded"
	mediaMultipart  = "multipart/form-data"
)

// bodyKind is how a request's body is encoded.
type bodyKind int

const (
	bodyJSON bodyKind = iota
	bodyForm          // urlencoded or multipart: a post from one of the service's HTML pages
)

// mediaTypeOf is the request's media type, lower-cased and without parameters; "" when absent
// or malformed.
func mediaTypeOf(r *http.Request) string {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return ""
	}
	return mt
}

// bodyKindOf says how the body of a route taking JSON and, when formOK, forms is encoded: a 415
// problem for any other content type. A form request is marked to be answered with HTML.
func bodyKindOf(c *gin.Context, formOK bool) (bodyKind, error) {
	switch mediaTypeOf(c.Request) {
	case mediaJSON:
		return bodyJSON, nil
	case mediaURLEncoded, mediaMultipart:
		if formOK {
			answerHTML(c)
			return bodyForm, nil
		}
	}
	if formOK {
		return 0, newError(http.StatusUnsupportedMediaType,
			"The body must be application/json, application/x-www-form-urlencoded or multipart/form-data.")
	}
	return 0, newError(http.StatusUnsupportedMediaType, "The body must be application/json.")
}

// decodeJSON reads the body as exactly one JSON object into dst, refusing invalid UTF-8, unknown
// fields and trailing data. Every failure is a 400 problem, except a body over the limit (413).
func decodeJSON(c *gin.Context, dst any) error {
	data, err := io.ReadAll(c.Request.Body) // at most MaxBodyBytes (limitBody)
	if err != nil {
		var maxBytesErr *http.MaxBytesError
		if errors.As(err, &maxBytesErr) {
			return err
		}
		return badRequest("The request body could not be read.", err)
	}
	// JSON is UTF-8 (RFC 8259); encoding/json would silently turn invalid bytes into U+FFFD.
	if !utf8.Valid(data) {
		return badRequest("The request body is not valid UTF-8.", nil)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest("The request body must hold one JSON object and nothing after it.", nil)
	}
	return nil
}

// jsonError turns a decoding error into its public answer. The details name the field at fault
// (the client's own input, bounded in length) but never echo values.
func jsonError(err error) error {
	var (
		syntaxErr    *json.SyntaxError
		typeErr      *json.UnmarshalTypeError
		unknownField = "json: unknown field "
	)
	switch {
	case errors.Is(err, io.EOF):
		return badRequest("The request body is empty; it must be a JSON object.", nil)
	case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("The request body is not valid JSON.", nil)
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return badRequest("The request body must be a JSON object.", nil)
		}
		return badRequest(fmt.Sprintf("Field %s must be a %s.", quoteField(typeErr.Field), typeErr.Type.Kind()), nil)
	case strings.HasPrefix(err.Error(), unknownField):
		return badRequest(fmt.Sprintf("Unknown field %s.", quoteField(strings.TrimPrefix(err.Error(), unknownField))), nil)
	default:
		return badRequest("The request body could not be read as JSON.", err)
	}
}

// quoteField bounds a field name taken from the client's input before it goes into a detail.
func quoteField(name string) string {
	name = strings.Trim(name, `"`)
	if len(name) > 64 {
		return `"` + strings.ToValidUTF8(name[:64], "") + `…"`
	}
	return `"` + name + `"`
}

// parseForm reads an urlencoded or multipart body (never the query string) and returns its
// fields. A malformed form is a 400 problem; a body over the limit a 413.
func parseForm(c *gin.Context) (url.Values, error) {
	r := c.Request
	var err error
	if mediaTypeOf(r) == mediaMultipart {
		err = r.ParseMultipartForm(MaxBodyBytes)
		if r.MultipartForm != nil {
			defer func() { _ = r.MultipartForm.RemoveAll() }()
		}
	} else {
		err = r.ParseForm()
	}
	if err != nil {
		var maxBytesErr *http.MaxBytesError
		if errors.As(err, &maxBytesErr) {
			return nil, err
		}
		return nil, badRequest("The form body is malformed.", err)
	}
	return r.PostForm, nil
}
