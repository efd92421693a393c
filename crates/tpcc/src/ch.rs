//! CH-benCHmark's analytical queries (Cole et al., "The mixed workload CH-benCHmark",
//! DBTest 2011) that read only TPC-C's tables: TPC-H's questions asked of the orders
//! the transactions enter. The benchmark's upper date bound of 2020 is 2030 here, so
//! that orders entered today qualify.

/// The queries by CH number.
pub const QUERIES: [(&str, &str); 4] = [
    (
        "Q1",
        "SELECT ol_number, SUM(ol_quantity) AS sum_qty, SUM(ol_amount) AS sum_amount, \
         AVG(ol_quantity) AS avg_qty, AVG(ol_amount) AS avg_amount, COUNT(*) AS count_order \
         FROM order_line WHERE ol_delivery_d > TIMESTAMP '2007-01-02 00:00:00' \
         GROUP BY ol_number ORDER BY ol_number",
    ),
    (
        "Q6",
        "SELECT SUM(ol_amount) AS revenue FROM order_line \
         WHERE ol_delivery_d >= TIMESTAMP '1999-01-01 00:00:00' \
         AND ol_delivery_d < TIMESTAMP '2030-01-01 00:00:00' \
         AND ol_quantity BETWEEN 1 AND 100000",
    ),
    (
        "Q12",
        "SELECT o_ol_cnt, \
         SUM(CASE WHEN o_carrier_id = 1 OR o_carrier_id = 2 THEN 1 ELSE 0 END) AS high_line_count, \
         SUM(CASE WHEN o_carrier_id <> 1 AND o_carrier_id <> 2 THEN 1 ELSE 0 END) AS low_line_count \
         FROM orders, order_line \
         WHERE ol_w_id = o_w_id AND ol_d_id = o_d_id AND ol_o_id = o_id \
         AND o_entry_d <= ol_delivery_d AND ol_delivery_d < TIMESTAMP '2030-01-01 00:00:00' \
         GROUP BY o_ol_cnt ORDER BY o_ol_cnt",
    ),
    (
        "Q14",
        "SELECT 100.00 * SUM(CASE WHEN i_data LIKE 'PR%' THEN ol_amount ELSE 0 END) \
         / (1 + SUM(ol_amount)) AS promo_revenue \
         FROM order_line, item \
         WHERE ol_i_id = i_id AND ol_delivery_d >= TIMESTAMP '2007-01-02 00:00:00' \
         AND ol_delivery_d < TIMESTAMP '2030-01-02 00:00:00'",
    ),
];
