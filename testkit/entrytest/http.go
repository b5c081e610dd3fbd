package entrytest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/oncekey/oncekey/durable/driver/wire"
)

// Post is the request of an adapter that speaks HTTP (claimhttp,
// claimriver): it POSTs payload as JSON to url through client under the
// idempotency key key (its Idempotency-Key header in the wire format),
// with header's fields added, and returns the response, its body read and
// closed. Its error is the Detail of the Error answer.
func Post(ctx context.Context, client *http.Client, url, key string, payload []byte, header http.Header) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return nil, nil, err
	}
	q, err := wire.FormatKey(key)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Idempotency-Key", q)
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("read the body: %w", err)
	}
	return res, body, nil
}
