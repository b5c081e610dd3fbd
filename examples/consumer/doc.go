// Command consumer is a worker that consumes "charge" messages from NATS
// JetStream and charges each one once, with claim/claimnats: the charge is a
// row written in the claim's transaction (Consumer.Do), so a message
// published twice, redelivered after a consumer died, or delivered to two
// competing workers is charged once, and a reused message id with another
// amount is terminated and never charged.
//
//	go run ./examples/consumer -demo
//	go run ./examples/consumer -demo -broker kafka
//
// With -demo it publishes duplicates, kills a consumer in the middle of a
// charge, lets a second consumer take the redeliveries, publishes a reused id
// with another amount, prints the story and exits 0 only if every
// expectation held. Without -demo it consumes subject "charges.charge" of
// stream ONCEKEY_CHARGES until interrupted.
//
// With -broker kafka it does the same on Kafka with claim/claimkafka:
// records carry an Idempotency-Key header, a killed group member's record is
// redelivered to the others from the committed offset, and an offset is
// committed only once its record is settled. Without -demo it consumes topic
// "charges" as group "charger".
//
// Services: -kafka (default $KAFKA_BROKERS) names Kafka brokers; empty
// starts an in-process one (kfake). -nats (default $NATS_URL) names a NATS server with JetStream;
// empty starts one in the process. -postgres / -redis (DATABASE_URL,
// REDIS_URL) as in the other examples; empty: an embedded SQLite file and an
// in-process Redis.
package main
