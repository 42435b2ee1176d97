package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// ErrorResponse is the body of every error answer, in the OpenAI API's
// shape (as vLLM writes it).
type ErrorResponse struct {
	Error ErrorInfo `json:"error"`
}

// ErrorInfo describes one error.
type ErrorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// apiError is an error with the HTTP status it is answered with.
type apiError struct {
	status int
	param  string // the request field at fault, "" when none
	msg    string
}

func (e *apiError) Error() string { return e.msg }

// errorType names a status as the OpenAI client libraries name their error classes.
func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusUnauthorized:
		return "AuthenticationError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusMethodNotAllowed:
		return "MethodNotAllowedError"
	case http.StatusRequestTimeout:
		return "RequestTimeoutError"
	case http.StatusRequestEntityTooLarge:
		return "RequestTooLargeError"
	case http.StatusUnsupportedMediaType:
		return "UnsupportedMediaTypeError"
	case http.StatusTooManyRequests:
		return "RateLimitError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	}
	return "InternalServerError"
}

func (e *apiError) response() ErrorResponse {
	info := ErrorInfo{Message: e.msg, Type: errorType(e.status), Code: e.status}
	if e.param != "" {
		p := e.param
		info.Param = &p
	}
	return ErrorResponse{Error: info}
}

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, param: param, msg: fmt.Sprintf(format, args...)}
}

func writeError(w http.ResponseWriter, e *apiError) {
	switch e.status {
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		w.Header().Set("Retry-After", "1")
	case http.StatusRequestTimeout:
		w.Header().Set("Connection", "close") // the rest of the body is not coming
	}
	writeJSON(w, e.status, e.response())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		data, _ = json.Marshal((&apiError{status: status, msg: "server: encode response: " + err.Error()}).response())
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(data, '\n'))
}

// decodeBody decodes a JSON request body into v, rejecting unknown fields
// and trailing data, and turns decoding errors into 400s (413 for a body
// over the limit, 408 for one that stalled past the body read timeout)
// that say what was wrong and where.
func decodeBody(r io.Reader, v any) *apiError {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		_, extra := dec.Token()
		var slow *bodyTimeoutError
		switch {
		case extra == io.EOF:
		case errors.As(extra, &slow):
			return &apiError{status: http.StatusRequestTimeout, msg: fmt.Sprintf("request body not received within %s", slow.timeout)}
		default:
			return badRequest("", "malformed JSON: data after the request object")
		}
		return nil
	}
	var (
		syntax   *json.SyntaxError
		typeErr  *json.UnmarshalTypeError
		tooLarge *http.MaxBytesError
		slow     *bodyTimeoutError
	)
	switch {
	case errors.As(err, &tooLarge):
		return &apiError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body exceeds %d bytes", tooLarge.Limit)}
	case errors.As(err, &slow):
		return &apiError{status: http.StatusRequestTimeout, msg: fmt.Sprintf("request body not received within %s", slow.timeout)}
	case errors.Is(err, io.EOF):
		return badRequest("", "malformed JSON: empty request body")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("", "malformed JSON: unexpected end of the request body")
	case errors.As(err, &syntax):
		return badRequest("", "malformed JSON at byte %d: %v", syntax.Offset, err)
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			return badRequest("", "malformed request: expected a JSON object, got %s", typeErr.Value)
		}
		return badRequest(field, "field %q: expected %s, got %s", field, jsonKind(typeErr.Type.String()), typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return badRequest(name, "unknown field %q in the request body", name)
	}
	var fieldErr *fieldError
	if errors.As(err, &fieldErr) {
		return badRequest(fieldErr.field, "field %q: %s", fieldErr.field, fieldErr.msg)
	}
	return badRequest("", "malformed request: %v", err)
}

// fieldError is returned by the custom unmarshalers of union-typed fields.
type fieldError struct{ field, msg string }

func (e *fieldError) Error() string { return e.field + ": " + e.msg }

// jsonKind names a Go type as a JSON reader would.
func jsonKind(goType string) string {
	switch {
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"), strings.HasPrefix(goType, "*int"):
		return "an integer"
	case strings.HasPrefix(goType, "float"), strings.HasPrefix(goType, "*float"):
		return "a number"
	case goType == "string", goType == "*string":
		return "a string"
	case goType == "bool", goType == "*bool":
		return "a boolean"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case strings.HasPrefix(goType, "map"), strings.HasPrefix(goType, "struct"), strings.HasPrefix(goType, "server."), strings.HasPrefix(goType, "*server."):
		return "an object"
	}
	return goType
}
