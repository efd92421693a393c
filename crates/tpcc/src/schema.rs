//! The TPC-C schema (TPC-C 5.11, clause 1.3) as transactional tables, and the column
//! positions the procedures read rows by.
//!
//! Two departures from the specification, both because every transactional table
//! needs a primary key: HISTORY, which has none, gets `h_c_payment_cnt` (the paying
//! customer's payment count after the payment) so that (customer, count) identifies a
//! row; and keys are ordered warehouse first, so that a district's rows are one key
//! prefix. Timestamps are nanoseconds, SQL's `TIMESTAMP`.

use gyre_replica::{Column, ColumnType, Database, Placement, Result};

/// A transactional table of the schema.
pub struct Table {
    pub name: &'static str,
    pub columns: Vec<Column>,
    /// Primary-key columns, in key order.
    pub key: &'static [&'static str],
}

const INT: ColumnType = ColumnType::Int32;
const TEXT: ColumnType = ColumnType::Text;
pub(crate) const TIMESTAMP: ColumnType = ColumnType::Timestamp {
    digits: 9,
    utc: false,
};

const fn decimal(precision: u8, scale: i8) -> ColumnType {
    ColumnType::Decimal { precision, scale }
}

fn cols(spec: &[(&str, ColumnType, bool)]) -> Vec<Column> {
    spec.iter()
        .map(|(n, t, nullable)| Column::new(*n, *t, *nullable))
        .collect()
}

/// The nine tables and the two secondary indexes, in loading order.
pub fn tables() -> Vec<Table> {
    let address = |p: &str| {
        [
            (format!("{p}_street_1"), TEXT),
            (format!("{p}_street_2"), TEXT),
            (format!("{p}_city"), TEXT),
            (format!("{p}_state"), TEXT),
            (format!("{p}_zip"), TEXT),
        ]
    };
    let with_address = |before: &[(&str, ColumnType)], p: &str, after: &[(&str, ColumnType)]| {
        let mut c: Vec<Column> = before
            .iter()
            .map(|(n, t)| Column::new(*n, *t, false))
            .collect();
        c.extend(
            address(p)
                .into_iter()
                .map(|(n, t)| Column::new(n, t, false)),
        );
        c.extend(after.iter().map(|(n, t)| Column::new(*n, *t, false)));
        c
    };
    let mut stock = vec![
        Column::new("s_i_id", INT, false),
        Column::new("s_w_id", INT, false),
        Column::new("s_quantity", INT, false),
    ];
    stock.extend((1..=10).map(|d| Column::new(format!("s_dist_{d:02}"), TEXT, false)));
    stock.extend(cols(&[
        ("s_ytd", INT, false),
        ("s_order_cnt", INT, false),
        ("s_remote_cnt", INT, false),
        ("s_data", TEXT, false),
    ]));
    vec![
        Table {
            name: "item",
            columns: cols(&[
                ("i_id", INT, false),
                ("i_im_id", INT, false),
                ("i_name", TEXT, false),
                ("i_price", decimal(5, 2), false),
                ("i_data", TEXT, false),
            ]),
            key: &["i_id"],
        },
        Table {
            name: "warehouse",
            columns: with_address(
                &[("w_id", INT), ("w_name", TEXT)],
                "w",
                &[("w_tax", decimal(4, 4)), ("w_ytd", decimal(12, 2))],
            ),
            key: &["w_id"],
        },
        Table {
            name: "stock",
            columns: stock,
            key: &["s_w_id", "s_i_id"],
        },
        Table {
            name: "district",
            columns: with_address(
                &[("d_id", INT), ("d_w_id", INT), ("d_name", TEXT)],
                "d",
                &[
                    ("d_tax", decimal(4, 4)),
                    ("d_ytd", decimal(12, 2)),
                    ("d_next_o_id", INT),
                ],
            ),
            key: &["d_w_id", "d_id"],
        },
        Table {
            name: "customer",
            columns: with_address(
                &[
                    ("c_id", INT),
                    ("c_d_id", INT),
                    ("c_w_id", INT),
                    ("c_first", TEXT),
                    ("c_middle", TEXT),
                    ("c_last", TEXT),
                ],
                "c",
                &[
                    ("c_phone", TEXT),
                    ("c_since", TIMESTAMP),
                    ("c_credit", TEXT),
                    ("c_credit_lim", decimal(12, 2)),
                    ("c_discount", decimal(4, 4)),
                    ("c_balance", decimal(12, 2)),
                    ("c_ytd_payment", decimal(12, 2)),
                    ("c_payment_cnt", INT),
                    ("c_delivery_cnt", INT),
                    ("c_data", TEXT),
                ],
            ),
            key: &["c_w_id", "c_d_id", "c_id"],
        },
        Table {
            name: "history",
            columns: cols(&[
                ("h_c_id", INT, false),
                ("h_c_d_id", INT, false),
                ("h_c_w_id", INT, false),
                ("h_d_id", INT, false),
                ("h_w_id", INT, false),
                ("h_date", TIMESTAMP, false),
                ("h_amount", decimal(6, 2), false),
                ("h_data", TEXT, false),
                ("h_c_payment_cnt", INT, false),
            ]),
            key: &["h_c_w_id", "h_c_d_id", "h_c_id", "h_c_payment_cnt"],
        },
        Table {
            name: "orders",
            columns: cols(&[
                ("o_id", INT, false),
                ("o_d_id", INT, false),
                ("o_w_id", INT, false),
                ("o_c_id", INT, false),
                ("o_entry_d", TIMESTAMP, false),
                ("o_carrier_id", INT, true),
                ("o_ol_cnt", INT, false),
                ("o_all_local", INT, false),
            ]),
            key: &["o_w_id", "o_d_id", "o_id"],
        },
        Table {
            name: "new_order",
            columns: cols(&[
                ("no_o_id", INT, false),
                ("no_d_id", INT, false),
                ("no_w_id", INT, false),
            ]),
            key: &["no_w_id", "no_d_id", "no_o_id"],
        },
        Table {
            name: "order_line",
            columns: cols(&[
                ("ol_o_id", INT, false),
                ("ol_d_id", INT, false),
                ("ol_w_id", INT, false),
                ("ol_number", INT, false),
                ("ol_i_id", INT, false),
                ("ol_supply_w_id", INT, false),
                ("ol_delivery_d", TIMESTAMP, true),
                ("ol_quantity", INT, false),
                ("ol_amount", decimal(6, 2), false),
                ("ol_dist_info", TEXT, false),
            ]),
            key: &["ol_w_id", "ol_d_id", "ol_o_id", "ol_number"],
        },
        // Secondary indexes. The row store indexes a table by its primary key only, so
        // the two lookups the transactions make by other columns get tables of their
        // own, written in the transactions that write the rows they index.
        Table {
            // A district's customers by last name, in the order clause 2.5.2.2 picks
            // from (first name); names never change.
            name: "customer_name",
            columns: cols(&[
                ("cn_w_id", INT, false),
                ("cn_d_id", INT, false),
                ("cn_last", TEXT, false),
                ("cn_first", TEXT, false),
                ("cn_c_id", INT, false),
            ]),
            key: &["cn_w_id", "cn_d_id", "cn_last", "cn_first", "cn_c_id"],
        },
        Table {
            // A customer's orders, newest last (Order-Status, clause 2.6.2.2).
            name: "customer_order",
            columns: cols(&[
                ("co_w_id", INT, false),
                ("co_d_id", INT, false),
                ("co_c_id", INT, false),
                ("co_o_id", INT, false),
            ]),
            key: &["co_w_id", "co_d_id", "co_c_id", "co_o_id"],
        },
    ]
}

/// Creates the tables in `db`.
pub fn create_tables(db: &Database) -> Result<()> {
    for t in tables() {
        db.create_table(t.name, t.columns, t.key)?;
    }
    Ok(())
}

/// The tables that grow with the warehouses and that CH-benCHmark's analytical
/// queries scan in bulk: a cluster may partition them over its workers, while item,
/// warehouse and district stay whole on each.
pub const GROWING_TABLES: [&str; 8] = [
    "stock",
    "customer",
    "history",
    "orders",
    "new_order",
    "order_line",
    "customer_name",
    "customer_order",
];

/// `CREATE TABLE` statements for the tables as transactional tables of a Gyre
/// coordinator: `WITH (replication = 'full')`, or for the [`GROWING_TABLES`]
/// `placement`'s.
pub fn ddl(placement: Placement) -> Vec<String> {
    tables()
        .into_iter()
        .map(|t| {
            let placement = if GROWING_TABLES.contains(&t.name) {
                placement
            } else {
                Placement::Full
            };
            let columns: Vec<String> = t
                .columns
                .iter()
                .map(|c| {
                    format!(
                        "{} {}{}",
                        c.name,
                        sql_type(c.column_type),
                        if c.nullable { "" } else { " NOT NULL" }
                    )
                })
                .collect();
            format!(
                "CREATE TABLE {} ({}, PRIMARY KEY ({})) WITH (replication = '{}')",
                t.name,
                columns.join(", "),
                t.key.join(", "),
                placement.name()
            )
        })
        .collect()
}

fn sql_type(t: ColumnType) -> String {
    match t {
        ColumnType::Int32 => "INT".into(),
        ColumnType::Text => "VARCHAR".into(),
        ColumnType::Decimal { precision, scale } => format!("DECIMAL({precision}, {scale})"),
        ColumnType::Timestamp { .. } => "TIMESTAMP".into(),
        other => unreachable!("the TPC-C schema has no {other:?} column"),
    }
}

/// Column positions, per table, in the order [`tables`] defines them.
pub mod col {
    pub mod customer_name {
        pub const C_ID: usize = 4;
    }
    pub mod customer_order {
        pub const O_ID: usize = 3;
    }
    pub mod item {
        pub const ID: usize = 0;
        pub const PRICE: usize = 3;
        pub const NAME: usize = 2;
        pub const DATA: usize = 4;
    }
    pub mod warehouse {
        pub const NAME: usize = 1;
        pub const TAX: usize = 7;
        pub const YTD: usize = 8;
    }
    pub mod stock {
        pub const QUANTITY: usize = 2;
        /// `s_dist_01`; district d's is `DIST_01 + d - 1`.
        pub const DIST_01: usize = 3;
        pub const YTD: usize = 13;
        pub const ORDER_CNT: usize = 14;
        pub const REMOTE_CNT: usize = 15;
        pub const DATA: usize = 16;
    }
    pub mod district {
        pub const W_ID: usize = 1;
        pub const NAME: usize = 2;
        pub const TAX: usize = 8;
        pub const YTD: usize = 9;
        pub const NEXT_O_ID: usize = 10;
    }
    pub mod customer {
        pub const ID: usize = 0;
        pub const D_ID: usize = 1;
        pub const W_ID: usize = 2;
        pub const FIRST: usize = 3;
        pub const LAST: usize = 5;
        pub const CREDIT: usize = 13;
        pub const DISCOUNT: usize = 15;
        pub const BALANCE: usize = 16;
        pub const YTD_PAYMENT: usize = 17;
        pub const PAYMENT_CNT: usize = 18;
        pub const DELIVERY_CNT: usize = 19;
        pub const DATA: usize = 20;
    }
    pub mod history {
        pub const C_ID: usize = 0;
        pub const C_D_ID: usize = 1;
        pub const C_W_ID: usize = 2;
        pub const D_ID: usize = 3;
        pub const W_ID: usize = 4;
        pub const AMOUNT: usize = 6;
    }
    pub mod orders {
        pub const ID: usize = 0;
        pub const D_ID: usize = 1;
        pub const W_ID: usize = 2;
        pub const C_ID: usize = 3;
        pub const ENTRY_D: usize = 4;
        pub const CARRIER_ID: usize = 5;
        pub const OL_CNT: usize = 6;
    }
    pub mod new_order {
        pub const O_ID: usize = 0;
    }
    pub mod order_line {
        pub const O_ID: usize = 0;
        pub const D_ID: usize = 1;
        pub const W_ID: usize = 2;
        pub const I_ID: usize = 4;
        pub const SUPPLY_W_ID: usize = 5;
        pub const DELIVERY_D: usize = 6;
        pub const QUANTITY: usize = 7;
        pub const AMOUNT: usize = 8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The position constants name the columns they say they do.
    #[test]
    fn positions_match_names() {
        let t = tables();
        let at = |table: &str, i: usize| {
            t.iter().find(|x| x.name == table).unwrap().columns[i]
                .name
                .clone()
        };
        assert_eq!(at("item", col::item::PRICE), "i_price");
        assert_eq!(at("item", col::item::DATA), "i_data");
        assert_eq!(at("warehouse", col::warehouse::TAX), "w_tax");
        assert_eq!(at("warehouse", col::warehouse::YTD), "w_ytd");
        assert_eq!(at("stock", col::stock::DIST_01), "s_dist_01");
        assert_eq!(at("stock", col::stock::YTD), "s_ytd");
        assert_eq!(at("stock", col::stock::REMOTE_CNT), "s_remote_cnt");
        assert_eq!(at("stock", col::stock::DATA), "s_data");
        assert_eq!(at("district", col::district::TAX), "d_tax");
        assert_eq!(at("district", col::district::NEXT_O_ID), "d_next_o_id");
        assert_eq!(at("customer", col::customer::LAST), "c_last");
        assert_eq!(at("customer", col::customer::CREDIT), "c_credit");
        assert_eq!(at("customer", col::customer::DISCOUNT), "c_discount");
        assert_eq!(at("customer", col::customer::BALANCE), "c_balance");
        assert_eq!(
            at("customer", col::customer::DELIVERY_CNT),
            "c_delivery_cnt"
        );
        assert_eq!(at("customer", col::customer::DATA), "c_data");
        assert_eq!(at("history", col::history::AMOUNT), "h_amount");
        assert_eq!(at("orders", col::orders::CARRIER_ID), "o_carrier_id");
        assert_eq!(at("orders", col::orders::OL_CNT), "o_ol_cnt");
        assert_eq!(
            at("order_line", col::order_line::DELIVERY_D),
            "ol_delivery_d"
        );
        assert_eq!(at("order_line", col::order_line::AMOUNT), "ol_amount");
    }

    #[test]
    fn ddl_names_every_column_and_key() {
        let ddl = ddl(Placement::Full);
        assert_eq!(ddl.len(), 11);
        assert!(ddl[2].starts_with("CREATE TABLE stock (s_i_id INT NOT NULL"));
        assert!(ddl[2].contains("PRIMARY KEY (s_w_id, s_i_id)"));
        assert!(ddl[6].contains("o_carrier_id INT,"));
        let partitioned = super::ddl(Placement::Partitioned);
        for (t, ddl) in tables().iter().zip(&partitioned) {
            assert_eq!(
                ddl.ends_with("WITH (replication = 'partitioned')"),
                GROWING_TABLES.contains(&t.name),
                "{ddl}"
            );
        }
    }
}

#[cfg(test)]
mod sql_file {
    /// `scripts/tpcc_schema.sql` holds [`super::ddl`]'s statements for SQL clients
    /// (`gyre sql -f`); `GYRE_WRITE_TPCC_SQL=1 cargo test -p gyre-tpcc` rewrites it.
    #[test]
    fn the_schema_file_matches_the_schema() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/tpcc_schema.sql");
        let want = format!(
            "-- TPC-C's tables as transactional tables (crates/tpcc/src/schema.rs).\n{};\n",
            super::ddl(gyre_replica::Placement::Full).join(";\n")
        );
        if std::env::var_os("GYRE_WRITE_TPCC_SQL").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let got = std::fs::read_to_string(path).unwrap_or_default();
        assert_eq!(
            got, want,
            "{path} is out of date: rerun with GYRE_WRITE_TPCC_SQL=1"
        );
    }
}
