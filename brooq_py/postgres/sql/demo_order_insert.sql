-- name: demo_order_insert
-- The demo's own write, made in the same transaction as an enqueue.
INSERT INTO {orders} (id, email) VALUES (%(id)s, %(email)s)
