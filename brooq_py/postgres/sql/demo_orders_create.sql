-- name: demo_orders_create
-- The demo's own table, standing for an application's data (created in the demo's schema).
CREATE TABLE {orders} (id int PRIMARY KEY, email text NOT NULL)
