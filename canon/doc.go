// Package canon computes deterministic request fingerprints: the RFC 8785
// canonical form of JSON ([JSON]), and a versioned SHA-256 [Fingerprint] of
// an HTTP request's intent ([Request]).
//
// An idempotency key names one logical operation; the fingerprint is how a
// retry is checked against it. A fingerprint that differs for the same
// intent produces false "key reused with a different payload" errors; one
// that matches for different intents merges two operations. So the
// canonical form is exact: same intent, same bytes, every time, on every
// machine and Go version.
//
// # What is in a request fingerprint
//
// [Request] hashes, unambiguously (each part length-prefixed, the whole
// domain-separated from [Sum]):
//
//   - the method, as sent ("" counts as GET);
//   - [Options.Operation], as given;
//   - the URL path in escaped form, with percent escapes of unreserved
//     characters decoded and other escapes' hex uppercased (RFC 3986
//     section 6.2.2), so "/a%2Fb" and "/a/b" differ;
//   - every query parameter, sorted by name then value (repeated names
//     kept; "?a" and "?a=" are the same, as url.ParseQuery reads them);
//   - each header named in [Options.Headers]: its lowercased name and its
//     values in received order, each trimmed of spaces and tabs, the headers
//     taken in sorted name order ("host" means r.Host);
//   - the body, read up to [Options.MaxBody] (default 1 MiB), in the form
//     its Content-Type media type (compared case-insensitively) calls for,
//     as the next section says.
//
// # How a body enters
//
//   - application/json and every type/subtype ending in +json: the media
//     type, then the body through [JSONStrict] minus the members named by
//     [Options.Exclude]. So member order, whitespace, escape spelling and
//     number spelling do not matter; charset parameters are ignored.
//   - application/x-www-form-urlencoded: the media type, then the
//     parameters sorted by name then value.
//   - an empty body (none, http.NoBody, or zero bytes): only that it is
//     empty; its Content-Type is ignored.
//   - anything else, including a missing or malformed Content-Type: the
//     media type with its parameters in sorted order, then the raw bytes.
//
// # What is not
//
//   - Every header not named in [Options.Headers]: transport noise such as
//     traceparent, tracestate, user-agent, content-length, accept-encoding,
//     connection, and the Idempotency-Key itself. Content-Type enters only
//     through the body rule above.
//   - The scheme, host (unless "host" is listed), port, user info, fragment,
//     remote address, TLS state, protocol version, trailers, and cookies
//     (unless "cookie" is listed).
//   - The tenant: the caller scopes keys by tenant and operation already.
//   - JSON members named by [Options.Exclude], such as a client timestamp or
//     a trace id inside the body.
//   - The order of query parameters, of form parameters, of JSON object
//     members, and of the Options.Headers list; JSON whitespace; escape
//     spelling; the spelling of a number with the same double value ("1.0",
//     "1", "1e0"); charset parameters of JSON and form types.
//
// # Integers beyond 2^53
//
// RFC 8785 parses numbers as IEEE-754 doubles, so it rounds integers beyond
// 2^53: 9007199254740993 and 9007199254740992 canonicalize alike, and a
// 64-bit account id sent as a number could replay another account's result.
// [JSON] follows the RFC. The fingerprinting path ([Request], [JSONStrict])
// instead rejects, with an error matching [ErrInvalid], every plain
// integer literal (digits with an optional minus sign, no fraction and no
// exponent) whose double does not print as the same integer under RFC 8785:
// 9007199254740993 and 1000000000000000000000 (which prints as 1e+21) fail,
// 9007199254740992 and -0 pass. Clients send such values as strings.
// [Options.AllowImpreciseNumbers] turns the rule off. Numbers written with a
// fraction or an exponent are rounded as the RFC says (only plain integers
// are checked; exact decimals such as money belong in strings too), numbers
// too small for a double round to 0, and numbers too large fail. A rejected
// integer inside an excluded member does not fail the request.
//
// # Limits and errors
//
// Nesting deeper than 1000 levels fails; so do duplicate member names,
// invalid UTF-8 and lone surrogate escapes, as RFC 8785 requires. Three
// sentinels classify the errors, one branch each for an HTTP layer:
// [ErrInvalid] (the input cannot be fingerprinted) is 400, [ErrTooLarge]
// is 413, [ErrConfig] is a server misconfiguration (500); an error
// reading the body (the client went away) matches none of them. No error
// message quotes the input.
//
// # Versions
//
// Every fingerprint starts with its version, "v1:". A future canonical form
// will use a new prefix, so stored v1 fingerprints stay valid and are never
// compared as equal to the new ones.
package canon
