//! Printing results as a table, CSV or JSON.

use arrow::util::pretty::pretty_format_batches;
use gyre_cluster::coordinator::StatementResult;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Csv,
    Json,
}

pub fn print_results(
    results: &[StatementResult],
    format: Format,
) -> Result<(), Box<dyn std::error::Error>> {
    for r in results {
        if r.schema.fields().is_empty() {
            continue;
        }
        match format {
            Format::Table => {
                let rows: usize = r.batches.iter().map(|b| b.num_rows()).sum();
                if r.batches.is_empty() {
                    println!("(0 rows)");
                } else {
                    println!("{}", pretty_format_batches(&r.batches)?);
                    println!("({rows} row{})", if rows == 1 { "" } else { "s" });
                }
            }
            Format::Csv => {
                let mut w = arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(std::io::stdout());
                if r.batches.is_empty() {
                    let names: Vec<&str> = r
                        .schema
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect();
                    println!("{}", names.join(","));
                }
                for b in &r.batches {
                    w.write(b)?;
                }
            }
            Format::Json => {
                let mut w = arrow::json::ArrayWriter::new(std::io::stdout());
                let refs: Vec<&arrow::array::RecordBatch> = r.batches.iter().collect();
                w.write_batches(&refs)?;
                w.finish()?;
                if r.batches.is_empty() {
                    print!("[]");
                }
                println!();
            }
        }
    }
    Ok(())
}
